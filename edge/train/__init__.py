"""Training: the one loop of edge (:mod:`edge.train.loop`) and ``edge train`` on it (:mod:`edge.train.reference`).

``edge finetune`` (:mod:`edge.compress.finetune`: distillation, dilution, PIAD) runs the same loop with
its own task. The parts: the seeded batches (:mod:`~edge.train.batches`), the schedule and optimizer
(:mod:`~edge.train.schedule`), checkpoints (:mod:`~edge.train.checkpoint`), the held-out accuracy
(:mod:`~edge.train.held_out`).
"""

from edge.train.batches import check_global_batch, epoch_order, training_batch, training_set
from edge.train.held_out import held_out_accuracy
from edge.train.reference import TrainConfig, train
from edge.train.schedule import learning_rate, param_groups

__all__ = ["TrainConfig", "check_global_batch", "epoch_order", "held_out_accuracy", "learning_rate", "param_groups",
           "train", "training_batch", "training_set"]
