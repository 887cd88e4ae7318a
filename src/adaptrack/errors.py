"""Named errors. Every failure a user can cause has one, with a message that says how to fix it."""


class AdaptrackError(Exception):
    """Base class of every error adaptrack raises on purpose."""


class NoValidSequenceError(AdaptrackError):
    """The constraint admits no complete sequence within ``max_new_tokens``.

    Raised once the prefix tree proves it (the root's estimated valid mass Q[ε] is 0), so
    no method can loop on an empty language.
    """


class TreeLimitError(AdaptrackError):
    """The prefix tree grew past its node limit (``max_nodes``)."""


class ModelOutputError(AdaptrackError, ValueError):
    """A model returned next-token scores of the wrong shape or with no probability mass."""


class ModelLoadError(AdaptrackError):
    """A model could not be found, downloaded or loaded (the message says which and why)."""
