"""adaptrack: constrained decoding that does not distort the model's intent.

>>> import adaptrack as at
>>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
>>> c = at.constraints.choice(["b", "ab"])
>>> at.generate(lm, [], c, method="cd", temperature=0).texts  # "a" first: P(ab) = .024
['ab']
>>> at.generate(lm, [], c, method="exact", temperature=0).texts  # the best valid: P(b) = .04
['b']
"""

from . import constraints
from .errors import (
    AdaptrackError,
    BackendError,
    CallLimitError,
    CheckTimeoutError,
    GrammarError,
    InternalError,
    JSONDepthError,
    ModelLoadError,
    ModelOutputError,
    ModuleImportError,
    NoValidSequenceError,
    PromptTooLongError,
    SearchLimitError,
    SearchTimeoutError,
    TokenizerError,
    TreeLimitError,
)
from .eval import metrics
from .generate import (
    MAX_SECONDS,
    METHODS,
    SEARCH_BUDGET,
    FreeTextWarning,
    GenerationResult,
    Sample,
    SearchFallbackWarning,
    exact_distribution,
    generate,
    generate_each,
)
from .lm import LanguageModel, TableLM, load_model
from .options import SamplingOptions
from .sampling.fastforward import FastForward
from .scoring import score
from .tokenization.tokenizer import Tokenizer
from .tokenization.vocab import Vocabulary

__version__ = "0.1.0"

__all__ = [
    "MAX_SECONDS",
    "METHODS",
    "SEARCH_BUDGET",
    "AdaptrackError",
    "BackendError",
    "CallLimitError",
    "CheckTimeoutError",
    "FastForward",
    "FreeTextWarning",
    "GenerationResult",
    "GrammarError",
    "InternalError",
    "JSONDepthError",
    "LanguageModel",
    "ModelLoadError",
    "ModelOutputError",
    "ModuleImportError",
    "NoValidSequenceError",
    "PromptTooLongError",
    "Sample",
    "SamplingOptions",
    "SearchFallbackWarning",
    "SearchLimitError",
    "SearchTimeoutError",
    "TableLM",
    "Tokenizer",
    "TokenizerError",
    "TreeLimitError",
    "Vocabulary",
    "constraints",
    "exact_distribution",
    "generate",
    "generate_each",
    "load_model",
    "metrics",
    "score",
]
