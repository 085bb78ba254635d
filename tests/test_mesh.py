"""Process groups and device meshes: coordinates, groups per dimension, sub-meshes, collectives on them."""

import numpy as np
import pytest

import minidist as md
import minidist.dist as dist
from minidist.runtime import launch


def _mesh3d():
    mesh = md.init_device_mesh((2, 2, 2), ("dp", "pp", "tp"))
    r = dist.get_rank()
    out = {
        "coord": mesh.get_coordinate(),
        "tp": mesh.get_group("tp").ranks,
        "dp": mesh["dp"].get_group().ranks,
        "local": {n: mesh.get_local_rank(n) for n in ("dp", "pp", "tp")},
        "sub2": mesh["dp", "tp"].mesh.tolist(),
        "sub2_swapped": mesh["tp", "dp"].mesh.tolist(),
        "sub2_groups": mesh["dp", "tp"].get_group("tp").ranks,
    }
    # a sum over tp, then over dp, then over pp is a sum over everything
    x = np.array([float(r)])
    dist.all_reduce(x, group=mesh.get_group("tp"))
    out["tp_sum"] = x[0]
    dist.all_reduce(x, group=mesh["dp"].get_group())
    dist.all_reduce(x, group=mesh.get_group("pp"))
    out["total"] = x[0]
    return out


def test_three_dimensional_mesh():
    res = launch(_mesh3d, 8)
    for r, o in enumerate(res):
        d, p, t = r // 4, (r // 2) % 2, r % 2
        assert o["coord"] == (d, p, t)
        assert o["local"] == {"dp": d, "pp": p, "tp": t}
        assert o["tp"] == (r - t, r - t + 1)
        assert o["dp"] == (r % 4, r % 4 + 4)
        assert o["tp_sum"] == (r - t) + (r - t + 1)
        assert o["total"] == sum(range(8))
        base = p * 2
        assert o["sub2"] == [[base, base + 1], [base + 4, base + 5]]
        assert o["sub2_swapped"] == [[base, base + 4], [base + 1, base + 5]]
        assert o["sub2_groups"] == o["tp"]


def test_mesh_errors_name_the_problem():
    def f():
        errs = []
        for call in (
            lambda: md.init_device_mesh((3, 2), ("dp", "tp")),
            lambda: md.init_device_mesh((2, 2), ("dp", "tp"))["cp"],
            lambda: md.init_device_mesh((2, 2), ("dp", "dp")),
            lambda: md.init_device_mesh((2, 2), ("dp", "tp")).get_local_rank(),
        ):
            try:
                call()
            except (ValueError, KeyError) as e:
                errs.append(str(e))
        return errs

    errs = launch(f, 4)[0]
    assert "holds 6 ranks but the world has 4" in errs[0]
    assert "no dimension 'cp'" in errs[1]
    assert "distinct dimension names" in errs[2]
    assert "name a dimension" in errs[3]


def test_torch_style_signature_and_groups():
    def f():
        mesh = md.init_device_mesh("cuda", (4,), mesh_dim_names=("dp",))
        g = dist.new_group([0, 2])
        info = (mesh.get_local_rank(), mesh.size(), dist.get_rank(g), dist.get_world_size(g))
        if dist.get_rank() in g:
            x = np.array([dist.get_rank()])
            dist.broadcast(x, src=2, group=g)  # src is a global rank
            info += (int(x[0]),)
        return info

    res = launch(f, 4)
    assert res[0] == (0, 4, 0, 2, 2) and res[2] == (2, 4, 1, 2, 2)
    assert res[1] == (1, 4, -1, -1) and res[3] == (3, 4, -1, -1)  # -1 off the group, as torch says


def test_new_group_validates_ranks():
    def f():
        with pytest.raises(ValueError, match="outside the world"):
            dist.new_group([0, 9])
        with pytest.raises(ValueError, match="duplicates"):
            dist.new_group([1, 1])
        return True

    assert all(launch(f, 2))


def test_flattened_groups_and_the_bijection_over_every_axis():
    """Along any dimension (or set of them) the world splits into disjoint groups, one per setting of the
    other coordinates; every rank is in exactly one, and its local rank is its row-major index there."""
    from minidist.parallel import ParallelConfig, build_mesh

    config = ParallelConfig(dp=2, ep=2, cp=2)
    world = config.world_size
    meshes = [build_mesh(config, rank=r) for r in range(world)]
    for dims in [("dp",), ("ep",), ("cp",), ("dp", "cp"), ("dp", "ep", "cp"), ("cp", "dp")]:
        groups = {m.get_group(dims) for m in meshes}
        size = meshes[0].size(dims)
        assert len(groups) == world // size and all(g.size() == size for g in groups), dims
        assert sorted(r for g in groups for r in g.ranks) == list(range(world)), dims
        for m in meshes:
            assert m.get_group(dims).ranks[m.get_local_rank(dims)] == m.rank, dims
    m = meshes[5]  # (pp, dp, ep, cp, tp) = (0, 1, 0, 1, 0)
    assert m.get_group(("dp", "cp")).ranks == (0, 1, 4, 5) and m.get_group("ep").ranks == (5, 7)
    assert m.get_local_rank(("dp", "ep")) == 2 and m.size(("dp", "ep", "cp")) == 8
    with pytest.raises(ValueError, match="twice"):
        m.get_group(("dp", "dp"))
