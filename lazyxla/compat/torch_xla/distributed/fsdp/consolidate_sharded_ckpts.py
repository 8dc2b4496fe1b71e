"""``python -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts``: consolidate sharded FSDP checkpoints from
the command line (``--ckpt_prefix``, ``--ckpt_suffix``, ``--save_path``), as torch_xla's tool does.

Example::

    python -m lazyxla.run -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts \\
        --ckpt_prefix /tmp/ckpt --ckpt_suffix "_rank-*-of-*.pth"
"""

from __future__ import annotations

import argparse

from lazyxla.compat.torch_xla.distributed.fsdp.state_dict_utils import consolidate_sharded_model_checkpoints


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and consolidate.

    Example::

        main(["--ckpt_prefix", "/tmp/ckpt", "--ckpt_suffix", "_rank-*-of-*.pth"])
    """
    parser = argparse.ArgumentParser(description="Consolidate the sharded checkpoints of an FSDP model.")
    parser.add_argument("--ckpt_prefix", type=str, required=True, help="path prefix of the sharded checkpoint files")
    parser.add_argument("--ckpt_suffix", type=str, default="*.pth", help="the files' suffix (a glob pattern)")
    parser.add_argument("--save_path", type=str, default="", help="default: ckpt_prefix + '_consolidated.pth'")
    args = parser.parse_args(argv)
    consolidate_sharded_model_checkpoints(args.ckpt_prefix, args.ckpt_suffix, args.save_path)


if __name__ == "__main__":
    main()
