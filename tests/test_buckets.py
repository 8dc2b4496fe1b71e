"""lazyxla.Buckets and DeviceLoader(pad_to_buckets=): variable-length batches padded on the host to a few shapes."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

import lazyxla


def _hf_batch(rows=2, n=5):
    ids = torch.arange(1, rows * n + 1).reshape(rows, n)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(rows, n, dtype=torch.long),
        "token_type_ids": torch.ones(rows, n, dtype=torch.long),
        "special_tokens_mask": torch.zeros(rows, n, dtype=torch.long),
        "position_ids": torch.arange(n).repeat(rows, 1),
        "labels": ids.clone(),
        "class_labels": torch.arange(rows),  # [batch]: not a sequence, never padded along the sequence
        "features": torch.ones(rows, 7),  # another size along dim 1: left as it is
    }


def test_dict_batches_pad_each_sequence_tensor_with_its_own_value():
    out = lazyxla.Buckets((4, 8, 16), pad_values={"input_ids": 99})(_hf_batch())
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 99, 99, 99], [6, 7, 8, 9, 10, 99, 99, 99]]
    assert out["attention_mask"].tolist() == [[1] * 5 + [0] * 3] * 2
    assert out["token_type_ids"].tolist() == [[1] * 5 + [0] * 3] * 2
    assert out["special_tokens_mask"].tolist() == [[0] * 5 + [1] * 3] * 2
    assert out["position_ids"].tolist() == [list(range(8))] * 2  # padded positions go on counting
    assert out["labels"][:, 5:].tolist() == [[-100] * 3] * 2 and torch.equal(
        out["labels"][:, :5], out["input_ids"][:, :5]
    )
    assert out["class_labels"].tolist() == [0, 1] and out["features"].shape == (2, 7)
    assert all(t.dtype == _hf_batch()[k].dtype for k, t in out.items())


def test_the_batch_keeps_its_type_and_non_tensor_entries():
    transformers = pytest.importorskip("transformers")
    batch = transformers.BatchEncoding(
        {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3)}
    )
    out = lazyxla.Buckets((4,))(batch)
    assert type(out) is transformers.BatchEncoding and out["input_ids"].shape == (1, 4)
    tagged = lazyxla.Buckets((4,))({"input_ids": torch.ones(1, 3, dtype=torch.long), "ids": ["a"], "n": 3})
    assert tagged["ids"] == ["a"] and tagged["n"] == 3


def test_a_length_equal_to_a_bucket_is_not_copied():
    batch = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8)}
    out = lazyxla.Buckets((8, 16))(batch)
    assert out["input_ids"] is batch["input_ids"] and out["attention_mask"] is batch["attention_mask"]


def test_tuples_tensors_and_namedtuples():
    ids, labels = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    padded_ids, padded_labels = lazyxla.Buckets((4,), pad_values=(7, -100))((ids, labels))
    assert padded_ids.tolist() == [[1, 1, 1, 7]] * 2 and padded_labels.tolist() == [[1, 1, 1, -100]] * 2
    x, y = lazyxla.Buckets((4,))([torch.ones(2, 3), torch.tensor([5, 6])])  # a list stays a list; y is [batch]
    assert x.tolist() == [[1, 1, 1, 0]] * 2 and y.tolist() == [5, 6]
    assert lazyxla.Buckets((4,), pad_values=-1.5)(torch.ones(1, 2)).tolist() == [[1, 1, -1.5, -1.5]]
    Batch = namedtuple("Batch", ["input_ids", "labels"])
    out = lazyxla.Buckets((4,))(Batch(ids, labels))  # field names choose values as dict keys do
    assert isinstance(out, Batch) and out.labels.tolist() == [[1, 1, 1, -100]] * 2


def test_inputs_embeds_pad_along_the_sequence_not_the_hidden_dim():
    out = lazyxla.Buckets((4,))({"inputs_embeds": torch.ones(2, 3, 5), "attention_mask": torch.ones(2, 3)})
    assert out["inputs_embeds"].shape == (2, 4, 5) and out["inputs_embeds"][:, 3].abs().sum() == 0
    last = lazyxla.Buckets((4,), dim=-1)(torch.ones(2, 6, 3))  # dim=-1: the last dimension
    assert last.shape == (2, 6, 4)


def test_multiple_of_and_length_for():
    assert [lazyxla.Buckets(multiple_of=8).length_for(n) for n in (1, 8, 9, 300)] == [8, 8, 16, 304]
    assert [lazyxla.Buckets((128, 64, 64)).length_for(n) for n in (1, 64, 65)] == [64, 64, 128]
    assert lazyxla.Buckets(multiple_of=8)(torch.ones(1, 9)).shape == (1, 16)


def test_attention_mask_is_added_where_a_dict_batch_has_none():
    out = lazyxla.Buckets((4,))({"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": torch.zeros(2, 3)})
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0]] * 2 and out["attention_mask"].dtype == torch.long
    exact = lazyxla.Buckets((3,))({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    assert exact["attention_mask"].tolist() == [[1, 1, 1]] * 2  # also without padding: every batch has the same keys
    plain = lazyxla.Buckets((4,), add_attention_mask=False)({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    assert list(plain) == ["input_ids"]


def test_a_short_batch_gets_masked_rows():
    batch = _hf_batch(rows=2, n=3)
    out = lazyxla.Buckets((4,), batch_size=3)(batch)
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        **{k: (3, 4) for k in ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "labels")},
        "position_ids": (3, 4),
        "class_labels": (3,),
        "features": (3, 7),
    }
    assert out["attention_mask"][2].tolist() == [0] * 4 and out["labels"][2].tolist() == [-100] * 4
    assert out["class_labels"].tolist() == [0, 1, 0] and out["position_ids"][2].tolist() == [0, 1, 2, 3]
    hf_labels = lazyxla.Buckets((4,), batch_size=3)(
        {"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": torch.ones(2)}
    )
    assert hf_labels["labels"].tolist() == [1, 1, -100]  # sequence-classification labels: the padding row is ignored


def test_padding_leaves_a_masked_loss_unchanged():
    """The point of the padding values: cross-entropy over labels padded with -100 is the unpadded one."""
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10)
    batch = {"input_ids": torch.randint(0, 10, (3, 5)), "labels": torch.randint(0, 10, (3, 5))}

    def loss(b):
        return F.cross_entropy(head(emb(b["input_ids"])).flatten(0, 1), b["labels"].flatten())

    padded = lazyxla.Buckets((8,), batch_size=4)(batch)
    torch.testing.assert_close(loss(padded), loss(batch))


def test_errors_name_the_problem():
    buckets = lazyxla.Buckets((64, 128, 256))
    with pytest.raises(ValueError) as info:
        buckets({"input_ids": torch.ones(2, 300, dtype=torch.long)})
    message = str(info.value)
    for part in ("sequence length 300", "'input_ids' along dim 1", "largest bucket 256", "(64, 128, 256)"):
        assert part in message
    assert "Buckets(multiple_of=64)" in message and "truncation=True, max_length=256" in message
    with pytest.raises(ValueError, match="a batch has 5 rows, more than batch_size=4"):
        lazyxla.Buckets((8,), batch_size=4)(torch.ones(5, 3))
    for bad, match in [
        ({}, "give bucket lengths"),
        ({"lengths": (8,), "multiple_of": 8}, "give bucket lengths"),
        ({"lengths": ()}, "non-empty sequence"),
        ({"lengths": 64}, "non-empty sequence"),
        ({"lengths": (64, 0)}, "a bucket length must be a positive int, got 0"),
        ({"multiple_of": -8}, "multiple_of must be a positive int"),
        ({"lengths": (8,), "batch_size": 0}, "batch_size must be a positive int"),
        ({"lengths": (8,), "dim": 0}, "dim 0 is the batch dimension"),
    ]:
        with pytest.raises(ValueError, match=match):
            lazyxla.Buckets(**bad)
    with pytest.raises(TypeError, match="a padding value is a number"):
        lazyxla.Buckets((8,), pad_values={"input_ids": "pad"})
    with pytest.raises(TypeError, match=r"pad_to_buckets takes bucket lengths such as \(64, 128, 256\)"):
        lazyxla.DeviceLoader([], lazyxla.device(), pad_to_buckets=64)


def _variable_length_data(lengths, rows=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(1, 10, (rows, n), generator=g), torch.randint(0, 10, (rows, n), generator=g)) for n in lengths
    ]


def test_device_loader_pads_on_the_host_before_the_transfer(dev):
    data = _variable_length_data([3, 7, 5])
    batches = list(lazyxla.DeviceLoader(data, dev, pad_to_buckets=(4, 8), sync_each_step=False))
    assert [tuple(x.shape) for x, _ in batches] == [(4, 4), (4, 8), (4, 8)]
    padded_ops = lazyxla.metrics.counters()["ops_recorded"]
    lazyxla.metrics.reset()
    list(lazyxla.DeviceLoader(_variable_length_data([4, 8, 8]), dev, sync_each_step=False))
    assert padded_ops == lazyxla.metrics.counters()["ops_recorded"]  # the transfers' own: no padding op on the device
    for (x, y), (x0, y0) in zip(batches, data):
        n = x0.shape[1]
        assert torch.equal(x.cpu()[:, :n], x0) and (x.cpu()[:, n:] == 0).all()
        assert torch.equal(y.cpu()[:, :n], y0) and (y.cpu()[:, n:] == 0).all()


def test_a_batch_above_the_largest_bucket_raises_in_the_loop(dev):
    it = iter(lazyxla.DeviceLoader(_variable_length_data([3, 9]), dev, pad_to_buckets=(4, 8)))
    assert next(it)[0].shape == (4, 4)
    with pytest.raises(
        ValueError, match=r"sequence length 9 \(its first tensor along dim 1\), longer than the largest"
    ):
        next(it)


def _train(dev, data, **loader_kwargs):
    """A masked token-level loss over variable-length (ids, labels) batches: the trained model, each step's loss
    and the programs compiled (the loader syncs the last step when it ends)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = lazyxla.DeviceLoader(data, dev, **loader_kwargs) if dev.type == "lazyxla" else data
    losses = []
    for ids, labels in loader:
        loss = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return model, [float(v) for v in losses], lazyxla.metrics.counters()["compiles"]


def test_a_variable_length_loop_compiles_once_per_bucket(dev):
    lengths = [3, 7, 5, 3, 6, 2, 7]  # 5 distinct lengths, 2 buckets (none a bucket: its program is new)
    data = _variable_length_data(lengths)
    cpu_model, cpu_losses, _ = _train(torch.device("cpu"), data)
    lazyxla.metrics.reset()
    _, _, plain = _train(dev, data)
    assert plain == len(set(lengths)) + 1  # a program per length, and step 1's (no momentum yet)
    lazyxla.metrics.reset()
    model, losses, compiles = _train(dev, data, pad_to_buckets=lazyxla.Buckets((4, 8), pad_values=(0, -100)))
    assert compiles == 2 + 1  # a program per bucket, and step 1's
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-5, atol=1e-6)
    for p, want in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)
