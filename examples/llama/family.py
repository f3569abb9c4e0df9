"""The Llama 3 family as the shared language-model driver sees it (examples.common.lm)."""

from examples.common.lm import LMFamily

from . import model

FAMILY = LMFamily(name="llama", module=model, model_cls=model.Llama, tp_partial_params=())
