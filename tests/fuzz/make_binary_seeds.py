#!/usr/bin/env python3
"""Writes the binary seed inputs of the fuzz corpora: corpus/fuzz_safetensors/ and corpus/fuzz_token_file/.

The files are checked in; run this again only to change them. Each seed is a few hundred bytes at most, valid
ones exercising every path of an accepted file and invalid ones each breaking one rule of the format.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def safetensors(header, data=b"", length=None, pad=0):
    """A safetensors file: 8-byte little-endian header length, the JSON header (padded with spaces), the data."""
    text = (header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))).encode()
    text += b" " * pad
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def safetensors_seeds():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    bf16 = struct.pack("<2H", 0x3F80, 0xC000)  # 1.0, -2.0
    f16 = struct.pack("<3H", 0x3C00, 0x0001, 0x7C00)  # 1.0, the smallest subnormal, +inf
    return {
        "valid_f32_matrix": safetensors({"w": tensor("F32", [2, 2], 0, 16)}, f32),
        "valid_mixed_dtypes": safetensors(
            {
                "__metadata__": {"format": "pt"},
                "a.weight": tensor("BF16", [2], 0, 4),
                "b.bias": tensor("F16", [3], 4, 10),
                "c.ids": tensor("I64", [1], 10, 18),
                "d.mask": tensor("BOOL", [2], 18, 20),
            },
            bf16 + f16 + struct.pack("<q", 7) + b"\x01\x00",
        ),
        "valid_scalar_and_empty": safetensors(
            {"s": tensor("F32", [], 0, 4), "e": tensor("F32", [0, 5], 4, 4)}, struct.pack("<f", 9.0)
        ),
        "valid_padded_header": safetensors({"w": tensor("U8", [3], 0, 3)}, b"abc", pad=5),
        "valid_empty_header": safetensors("{}"),
        "invalid_truncated": b"\x10\x00\x00",
        "invalid_length_past_end": safetensors({"w": tensor("F32", [1], 0, 4)}, b"", length=4096),
        "invalid_not_json": safetensors('{"w": {"dtype": "F32",', b""),
        "invalid_unknown_dtype": safetensors({"w": tensor("F128", [1], 0, 16)}, bytes(16)),
        "invalid_shape_mismatch": safetensors({"w": tensor("F32", [3], 0, 8)}, bytes(8)),
        "invalid_gap": safetensors({"a": tensor("U8", [1], 0, 1), "b": tensor("U8", [1], 2, 3)}, bytes(3)),
        "invalid_overlap": safetensors({"a": tensor("U8", [2], 0, 2), "b": tensor("U8", [2], 1, 3)}, bytes(3)),
        "invalid_duplicate_key": safetensors(
            '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
            bytes(1),
        ),
        "invalid_too_deep": safetensors('{"a":{"shape":[[[1]]],"dtype":"U8","data_offsets":[0,1]}}', bytes(1)),
        "invalid_overflowing_shape": safetensors(
            {"w": tensor("F64", [4294967296, 4294967296, 16], 0, 0)}, b""
        ),
        "invalid_metadata_value": safetensors({"__metadata__": {"n": 1}}),
    }


def token_file(width_u32, vocab, seq_len, tokens, vocab_out_of_range=False):
    """The fuzz_token_file input layout (see fuzz_token_file.cpp): 6 argument bytes, then the file."""
    flags = (1 if width_u32 else 0) | (2 if vocab_out_of_range else 0)
    body = struct.pack("<%d%s" % (len(tokens), "I" if width_u32 else "H"), *tokens)
    return struct.pack("<Bi", flags, vocab) + bytes([seq_len - 1]) + body


def token_file_seeds():
    return {
        "valid_u16": token_file(False, 50257, 4, [0, 1, 2, 50256, 7, 8, 9, 10]),
        "valid_u32": token_file(True, 128256, 2, [128255, 0, 65536, 3]),
        "valid_exact_length": token_file(False, 10, 3, [1, 2, 3, 4]),
        "invalid_token_above_vocab": token_file(False, 100, 1, [5, 100, 6]),
        "invalid_odd_size": token_file(False, 100, 1, [1, 2]) + b"\x01",
        "invalid_u32_remainder": token_file(True, 100, 1, [1]) + b"\x00\x00",
        "invalid_too_short": token_file(False, 100, 8, [1, 2, 3]),
        "invalid_zero_vocab": token_file(False, 0, 1, [0, 0]),
        "invalid_negative_vocab": token_file(True, -5, 1, [0, 0]),
        "invalid_vocab_2_31": token_file(True, 0, 1, [0, 0], vocab_out_of_range=True),
        "invalid_empty_file": token_file(False, 100, 1, []),
    }


def main():
    for target, seeds in (("fuzz_safetensors", safetensors_seeds()), ("fuzz_token_file", token_file_seeds())):
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, contents in seeds.items():
            (folder / name).write_bytes(contents)


if __name__ == "__main__":
    main()
