"""What a subs user installs besides the engine: `subs.worker`, the Python worker SDK.

It imports nothing of `engine` or `bot` (tests/test_import_rules.py holds that), so a
worker depends only on the wire protocol (spec/protocol.schema.json), never on the
engine's internals.
"""
