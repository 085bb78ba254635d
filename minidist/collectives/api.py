"""Placeholder until the collective layer lands (next commit): every call says so."""


def _not_yet(*args, **kwargs):
    raise NotImplementedError("collectives are not implemented yet in this commit")


all_gather = all_gather_into_tensor = all_reduce = all_to_all_single = barrier = _not_yet
broadcast = gather = reduce = reduce_scatter_tensor = scatter = _not_yet
