"""Named errors: the error contract of the package, stated once.

- Bad arguments (a wrong type, a number out of range, an unknown name) raise ``TypeError``
  or ``ValueError`` before any model work, with a message that names the argument, what it
  got and what it takes.
- Every other failure a user can cause or meet raises a subclass of :class:`AdaptrackError`
  with a one-line message that says what happened and how to fix it. Errors that are also
  bad input (an invalid grammar, a prompt too long for the model) subclass ``ValueError``
  too, so ``except ValueError`` keeps working.
- A failure never throws away finished work: ``generate`` hands finished samples to
  ``on_sample`` as they finish, and the evaluation harness appends each finished job to its
  results file before starting the next.
- The command line prints ``adaptrack: error: <message>`` and exits 2 for these errors; a
  traceback means a bug.
"""


class AdaptrackError(Exception):
    """Base class of every error adaptrack raises on purpose."""


class NoValidSequenceError(AdaptrackError):
    """The constraint admits no complete sequence within ``max_new_tokens``.

    Raised once the prefix tree proves it (the root's estimated valid mass Q[ε] is 0), or,
    for every constrained method and ``exact_distribution``, up front when the
    constraint's shortest complete sequence needs more tokens than allowed
    (``Matcher.min_new_tokens``, or the bytes it forces from the start), so no method
    loops on an empty language and CD answers no invalid text for one.
    """


class SearchLimitError(AdaptrackError):
    """A search ran past one of its budgets (``max_nodes``, ``max_opened_bytes`` or
    ``max_seconds``); the message names it and how to raise it."""


class TreeLimitError(SearchLimitError):
    """The prefix tree grew past its node limit (``max_nodes``), or the expansions its Q
    tables hold grew past ``max_opened_bytes``."""


class CallLimitError(SearchLimitError):
    """A search made its budget of model calls (``search_budget`` x n x
    ``max_new_tokens``)."""


class SearchTimeoutError(SearchLimitError):
    """Sampling ran past its time budget (``max_seconds``)."""


class CheckTimeoutError(SearchTimeoutError):
    """A constraint's own checks (a predicate's, ``python()``'s) timed out more than
    ``max_timeouts`` times: a check too slow for its ``timeout``, not a search past its
    budget, so no fallback draws the missing samples (it would ask the same checks)."""


class GrammarError(AdaptrackError, ValueError):
    """A grammar (regex, JSON schema, Lark, GBNF) is invalid, or llguidance failed on it
    (for example its lexer or parser resource limits)."""


class TokenizerError(AdaptrackError, ValueError):
    """A tokenizer cannot encode a text: its tokens' bytes do not reproduce it (a
    SentencePiece tokenizer that prepends a space, a normalizer), or no token of the
    vocabulary starts at one of its bytes."""


class PromptTooLongError(AdaptrackError, ValueError):
    """The prompt plus ``max_new_tokens`` does not fit in the model's context window (found
    from its tokens, or from its size in bytes before it is read whole or tokenized)."""


class JSONDepthError(AdaptrackError, ValueError):
    """A JSON value (a schema, a request body, a results line) nests its arrays and objects
    deeper than ``adaptrack.limits.MAX_JSON_DEPTH`` levels."""


class ModuleImportError(AdaptrackError, ImportError):
    """A module named by the user (``constraints.from_module``, ``--api-module``) cannot be
    imported: not installed, or its import raised."""


class ModelOutputError(AdaptrackError, ValueError):
    """A model returned next-token scores of the wrong shape or with no probability mass."""


class ModelLoadError(AdaptrackError):
    """A model could not be found, downloaded or loaded (the message says which and why)."""


class BackendError(AdaptrackError):
    """A model backend failed while running (for example ``llama_decode`` returned an
    error); the message names the backend and its status."""


class InternalError(AdaptrackError, RuntimeError):
    """An invariant of the package failed: a bug, not a misuse; please report it with the
    message. A ``RuntimeError`` too, as such a failure was before it had a name."""

    def __init__(self, what: str) -> None:
        super().__init__(f"an invariant failed (a bug in adaptrack, please report it): {what}")


class ResultsMismatchError(AdaptrackError):
    """An evaluation results file cannot be appended to or read: not a regular file, not
    in the results format, or written by another task or with other options."""


class WorkerError(AdaptrackError):
    """An evaluation worker process failed to set up (the message carries its error) or
    died."""


class SandboxUnavailableError(AdaptrackError):
    """Generated code would run without isolation (no bubblewrap here, or the kernel
    refuses its namespaces) and the caller did not allow that explicitly
    (``allow_unsandboxed=True``, ``--unsafe-run-code``); the message says what is missing
    and how to install it."""


class ReplicaError(AdaptrackError):
    """The replicas of ``adaptrack serve --replicas`` cannot run: Ray Serve is missing (the
    message names the extra to install) or a replica failed to start (its error)."""
