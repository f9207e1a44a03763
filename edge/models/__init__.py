"""Models: timm ViTs by name, the bundled reference model, safe weights, geometry info."""

from edge.models.img_size import ImgSize, parse_img_size
from edge.models.info import ModelInfo, model_info
from edge.models.zoo import BUNDLED, ModelSpec, create_model, data_config, model_card, parse_model_spec

__all__ = ["BUNDLED", "ImgSize", "ModelInfo", "ModelSpec", "create_model", "data_config", "model_card", "model_info",
           "parse_img_size", "parse_model_spec"]
