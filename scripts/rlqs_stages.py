#!/usr/bin/env python3
"""Reads `perf script` output of a floodgate server answering RLQS reports and prints the
share of its CPU samples in each stage of a report (scripts/rlqs-profile.sh)."""
import sys, collections
# Attribute each sample to the innermost stage frame on its stack (leaf first).
STAGES = [
    ("decode the report", ["RequestDecoder", "Message::decode", "Message>::decode"]),
    ("encode the answer", ["EncodeBody", "Message::encode", "encode_varint"]),
    ("stats", ["record_usage", "record_rule"]),
    ("hits: keys", ["CounterKey::new", "demand_hits", "charge_hits", "CounterKey::of_rule"]),
    ("Redis: build call", ["batch_call", "Plan::new", "redis_hit", "encode_pipeline", "write_command", "full_keys"]),
    ("Redis: read reply", ["decode_stream", "read_reply", "ValueCodec"]),
    ("sockets (Redis, gRPC)", ["PipelineSink", "poll_read", "poll_write"]),
    ("memory store", ["MemoryBackend", "Counter::hit"]),
    ("assign + demand share", ["QuotaStream::assigned", "assign::assign", "Bucket::follow"]),
    ("match + bucket key", ["QuotaStream::verdict", "bucket_key", "bucket_descriptor", "order_matching", "Domain::find"]),
    ("usage split", ["QuotaStream::usage", "let_through_before_reset"]),
    ("charge: results", ["what_is_left", "quota_left", "judged", "charge_together"]),
    ("stream: rest", ["QuotaStream::answer", "QuotaStream::run"]),
    ("gRPC/HTTP2", ["hyper::", "h2::", "tonic::"]),
]
counts = collections.Counter(); total = 0
stack = []
def flush():
    global total
    if not stack: return
    total += 1
    for frame in stack:  # leaf first
        for name, pats in STAGES:
            if any(p in frame for p in pats):
                counts[name] += 1; return
    counts["runtime, kernel, other"] += 1
for line in sys.stdin:
    if not line.strip():
        flush(); stack = []; continue
    if line[0] in " \t":
        stack.append(line.strip())
flush()
for name, n in counts.most_common():
    print(f"{name:28s} {100*n/total:5.1f}%")
print("samples", total)
