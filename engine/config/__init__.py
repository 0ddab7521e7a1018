"""subs.toml, read into the Project the engine runs (SPEC §1).

The package's public face: what the rest of the code imports, and nothing else. Inside,
one idea a module, each importing only those below it (tests/test_import_rules.py
holds the order): model.py (what the engine reads), schema.py (what the file may
hold), wording.py (how a schema error reads), secrets.py (literal secrets refused, a
project's secrets found), checks.py (the rules that span keys), build.py (file ->
model), load.py (the whole read, in order, and the environment's overrides).

A new key goes in three places and a page: its pydantic field in schema.py, its field
in model.py, the line that carries it across in build.py, and its row in docs/config.md
(and a rule in checks.py if it depends on other keys).
"""

from engine.config.load import load_project, parse_project
from engine.config.model import (
    DEFAULT_FSYNC,
    AgentDecl,
    ConfigError,
    Fsync,
    McpBlock,
    MissingEnv,
    Project,
    ServeConfig,
    SlackOff,
    StoreConfig,
    TelemetryConfig,
    WatchEntry,
    slack_env_suffix,
)
from engine.config.secrets import project_secrets

__all__ = [
    "DEFAULT_FSYNC",
    "AgentDecl",
    "ConfigError",
    "Fsync",
    "McpBlock",
    "MissingEnv",
    "Project",
    "ServeConfig",
    "SlackOff",
    "StoreConfig",
    "TelemetryConfig",
    "WatchEntry",
    "load_project",
    "parse_project",
    "project_secrets",
    "slack_env_suffix",
]
