"""The evaluation metrics, kept importable here: they live in :mod:`adaptrack.eval.metrics`
(docs/design.md §4).

>>> from adaptrack import metrics
>>> round(metrics.pass_at_k(n=10, c=3, k=1), 6)
0.3
"""

from .eval.metrics import LogProb as LogProb
from .eval.metrics import __all__ as __all__
from .eval.metrics import em_at_k as em_at_k
from .eval.metrics import empirical_distribution as empirical_distribution
from .eval.metrics import kl_divergence as kl_divergence
from .eval.metrics import kl_to_distribution as kl_to_distribution
from .eval.metrics import kl_to_lm as kl_to_lm
from .eval.metrics import mean_at_k as mean_at_k
from .eval.metrics import pass_at_k as pass_at_k
from .eval.metrics import sample_kl as sample_kl
from .eval.metrics import sliding_kl as sliding_kl
