"""Our GGUF reader against gguf's own: every metadata value and every tensor's values, in a file gguf's writer
wrote (every value type; float, bf16 and quantized tensors). The embedded model's file is read by every test
that loads it, and its model checked against HF transformers' reading of the same file (test_engine_vs_hf)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from quail.engine.model import gguf_file


def _same_as_ggufs_reader(path) -> gguf_file.GGUFFile:
    ours, theirs = gguf_file.read(path), gguf.GGUFReader(str(path))
    assert list(ours.fields) == [key for key in theirs.fields if not key.startswith("GGUF.")]
    for key, value in ours.fields.items():
        assert value == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, their in zip(ours.tensors, theirs.tensors):
        assert mine.type == their.tensor_type and mine.dims == tuple(int(d) for d in their.shape), mine.name
        got = gguf.quants.dequantize(mine.data, gguf.GGMLQuantizationType(mine.type))
        np.testing.assert_array_equal(got, gguf.quants.dequantize(their.data, their.tensor_type), err_msg=mine.name)
    return ours


def test_every_value_type_and_tensor_reads_as_ggufs_reader_reads_it(tmp_path):
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint8("t.u8", 7)
    writer.add_int16("t.i16", -300)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int64("t.i64", -(1 << 40))
    writer.add_float32("t.f32", 0.25)
    writer.add_float64("t.f64", 1e-300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.text", "ünïcode ✓")
    writer.add_array("t.strings", ["a", "", "Ġthe", "<|im_end|>"])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.5])
    rng = np.random.default_rng(0)
    writer.add_tensor("plain", rng.standard_normal((3, 5), dtype=np.float32))
    writer.add_tensor("half", rng.standard_normal((4, 8)).astype(np.float16))
    rows = rng.standard_normal((2, 64), dtype=np.float32)
    for kind in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.BF16):
        writer.add_tensor(kind.name, gguf.quants.quantize(rows, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    read = _same_as_ggufs_reader(path)
    assert read.fields["t.text"] == "ünïcode ✓" and read.fields["t.strings"][2] == "Ġthe"
    assert read.tensors[0].dims == (5, 3), "innermost first, as the file stores them"


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_file.read(path)
