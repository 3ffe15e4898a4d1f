#!/usr/bin/python3
"""Reads TensorBoard event files with the standard library alone: the
TFRecord framing with both masked CRC-32Cs checked, and the Event protocol
buffer parsed field by field. It is the Go writer's independent oracle
(monitor's TestTensorBoardPython, cmd's TestMonitorTrain).

Prints one JSON object a line: {"file": ..., "file_version": ...} for the
file's version event, {"tag": ..., "step": ..., "value": ..., "wall_time":
...} for each scalar. Exits 1 naming the file and offset at a CRC mismatch
or a record cut short."""

import json
import struct
import sys


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf):
    """Yields (number, wire type, value) of a protocol buffer message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def read(path):
    data = open(path, "rb").read()
    off = 0
    while off < len(data):
        if off + 12 > len(data):
            fail(path, off, "record header cut short")
        (n,) = struct.unpack_from("<Q", data, off)
        (lcrc,) = struct.unpack_from("<I", data, off + 8)
        if masked(data[off:off + 8]) != lcrc:
            fail(path, off, "length crc mismatch")
        body = data[off + 12:off + 12 + n]
        if len(body) != n or off + 16 + n > len(data):
            fail(path, off, "record cut short")
        (dcrc,) = struct.unpack_from("<I", data, off + 12 + n)
        if masked(body) != dcrc:
            fail(path, off, "data crc mismatch")
        event(path, body)
        off += 16 + n


def event(path, body):
    wall, step, version, values = None, 0, None, []
    for num, wt, v in fields(body):
        if num == 1 and wt == 1:
            (wall,) = struct.unpack("<d", v)
        elif num == 2 and wt == 0:
            step = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wt == 2:
            version = v.decode()
        elif num == 5 and wt == 2:
            for snum, swt, sv in fields(v):
                if snum != 1 or swt != 2:
                    continue
                tag, simple = None, None
                for vnum, vwt, vv in fields(sv):
                    if vnum == 1 and vwt == 2:
                        tag = vv.decode()
                    elif vnum == 2 and vwt == 5:
                        (simple,) = struct.unpack("<f", vv)
                values.append((tag, simple))
    if version is not None:
        print(json.dumps({"file": path, "file_version": version, "wall_time": wall}))
    for tag, simple in values:
        print(json.dumps({"tag": tag, "step": step, "value": simple, "wall_time": wall}))


def fail(path, off, why):
    print("%s: offset %d: %s" % (path, off, why), file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        read(p)
