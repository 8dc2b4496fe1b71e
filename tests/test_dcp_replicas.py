"""``torch.distributed.checkpoint`` of an FSDP2 model and its AdamW state over replicas (one process per device,
``init_process_group("lazyxla")``): saved by 4 ranks, loaded by 2 (DCP reshards), against the CPU reference.

Multi-process runs start on 127.0.0.1 through ``lazyxla.spawn``, bounded by its ``timeout_s``.
"""

from __future__ import annotations

import dcp_workers as W  # tests/ is on sys.path (pytest puts it there); the children import it by name
import torch

import lazyxla


def _whole(runs: list[dict]) -> dict:
    """The ranks' parts joined: FSDP2 shards dimension 0 over the ranks in rank order (plain tensors: rank 0's)."""
    out = {}
    for k, v in runs[0]["state"].items():
        out[k] = torch.cat([r["state"][k] for r in runs]) if v.dim() > 0 else v
    return out


def test_fsdp2_state_saved_by_four_replicas_loads_on_two_equal(tmp_path):
    # DCP's plans travel in the process group's gather/scatter of CPU tensors, which raised NotImplementedError
    folder = str(tmp_path / "latest")
    saved = lazyxla.spawn(W.replica_save, args=(folder, 1), nprocs=4, timeout_s=300)
    loaded = lazyxla.spawn(W.replica_load, args=(folder,), nprocs=2, timeout_s=300)
    want, got = _whole(saved), _whole(loaded)
    # the saved state is the CPU run's (each rank's loss over its quarter of the batch: their mean the whole's)
    model, batches = W.mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=W.LR, foreach=True)
    (ref_loss,) = W.train(model, opt, W.mlp_loss, batches[:1])
    assert abs(sum(r["losses"][0] for r in saved) / 4 - ref_loss) < 1e-5
    ref = W.cpu_state(model, opt)
    assert sorted(want) == sorted(ref) == sorted(got)
    for k in ref:
        torch.testing.assert_close(want[k], ref[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"saved {k}: {m}")
        assert torch.equal(got[k], want[k]), k  # loaded at 2 ranks exactly as saved at 4
