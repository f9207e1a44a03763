"""Models: timm ViTs by name, the bundled reference model, safe weights, geometry info."""

from edge.models.img_size import ImgSize, parse_img_size
from edge.models.info import ModelInfo, model_info
from edge.models.zoo import (BUNDLED, ModelSpec, bundled_source, create_model, data_config, data_for, model_card,
                             parse_model_spec)

__all__ = ["BUNDLED", "ImgSize", "ModelInfo", "ModelSpec", "bundled_source", "create_model", "data_config",
           "data_for", "model_card", "model_info", "parse_img_size", "parse_model_spec"]
