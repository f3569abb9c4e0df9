"""The Qwen3 family as the shared language-model driver sees it (examples.common.lm)."""

from examples.common.lm import LMFamily

from . import model

FAMILY = LMFamily(name="qwen", module=model, model_cls=model.Qwen3, tp_partial_params=("q_norm", "k_norm"))
