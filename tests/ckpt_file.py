"""castor checkpoints (safetensors files) for the CLI tests, read by the
documented layout alone (an 8-byte little-endian header length, the JSON
header, the data section; struct, json and zlib only): a file's header and
data section, written back with __metadata__'s crc32 set anew (castor takes
a file whose tensors and crc32 disagree for a corrupt one), and a tensor's
floats."""
import json
import struct
import zlib


def read(path):
    """The header (a dict, __metadata__ among its keys) and the data section
    (a bytearray) of the file at path."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])


def meta(path):
    """The __metadata__ of the file at path."""
    return read(path)[0]["__metadata__"]


def write(path, header, data):
    """header and data as a file at path, crc32 made right, the header padded
    to a multiple of 8 bytes as castor writes it."""
    header["__metadata__"]["crc32"] = "%08x" % zlib.crc32(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(data))


def floats(header, data, name):
    """The float32 values of tensor name."""
    s, e = header[name]["data_offsets"]
    return struct.unpack("<%df" % ((e - s) // 4), bytes(data[s:e]))


def set_floats(header, data, name, values):
    """Tensor name's float32 values replaced by values (as many)."""
    s, e = header[name]["data_offsets"]
    data[s:e] = struct.pack("<%df" % ((e - s) // 4), *values)
