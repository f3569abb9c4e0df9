"""Symbolic shapes: how a graph whose sizes change is specialized."""

from __future__ import annotations


class Policy:
    def __init__(self, mode="exact", buckets=None, max_specializations=16):
        self.mode = mode
        self.buckets = buckets
        self.max_specializations = max_specializations

    @classmethod
    def from_options(cls, options):
        return cls(options.get("dynamic", "exact"), options.get("buckets"),
                   int(options.get("max_specializations", 16)))

    def run(self, graph, args, arrays, ints):
        key = graph.signature(arrays, ints)
        entry = graph.executables.get(key)
        if entry is None:
            entry = graph.executables[key] = graph._build(arrays, ints, graph.consts, key)
        return graph._execute(entry, args, arrays)
