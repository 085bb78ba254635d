"""Expert parallelism: the experts live on different devices and the tokens travel (chapter 18).

Property: sparsity of routing, and gradients are sums. A token needs k of the E experts, so the experts can be
spread over ``ep`` devices and each token sent only where its experts are, by a count exchange and two
all-to-alls (``expert_parallel``); a weight's gradient is summed over the ranks holding a copy of it, so dense
and expert weights are reduced over different groups (``expert_data_parallel``, built on ``data``).

Read by lab 12 (expert parallelism) and lab 16 (4D and 5D parallelism).
"""

from minidist.parallel.expert.expert_data_parallel import ExpertDataParallel
from minidist.parallel.expert.expert_parallel import EPGroup, expert_parallelize

__all__ = ["EPGroup", "ExpertDataParallel", "expert_parallelize"]
