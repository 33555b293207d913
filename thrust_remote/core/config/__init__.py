"""thrust.yaml: load, validate, and merge with THRUST_* variables and flags.

Errors name the file, the line and the field (`thrust.yaml:7: hosts.gpu.port: expected ...`), exit 78.
YAML is composed into nodes (not just loaded) so every value keeps the line it came from.
Precedence: command-line flags > THRUST_* environment > thrust.yaml > built-in defaults.
No file at all is fine: the host `local` and the jobs `snake` and `cartpole` always exist.

The rooms: model.py (the dataclasses and the names their values are checked against), discovery.py
(finding thrust.yaml and its project), bounded.py (reading untrusted YAML), reader.py (the node reader,
file:line failures), values.py (values several sections take), sections.py (a job's sections of
several keys as types: flags, metrics, objective, retry, idle stop), one module per section (hosts.py,
jobs.py with job_values.py and retry.py, notify.py, search.py), and loader.py, whose table of sections
reads the top level. This module re-exports what the rest of thrust_remote imports.
"""

# the protocol's word (a `resume:` template's field), re-exported for run/stages.py until it imports the protocol's
from thrust_remote.agent.protocol import CHECKPOINT_FIELD
from thrust_remote.core.config.bounded import read_text
from thrust_remote.core.config.discovery import CONFIG_NAME, find_config, project_root
from thrust_remote.core.config.loader import load_config, parse_config_text
from thrust_remote.core.config.model import (
    BEST_PARAMS_MARK,
    BEST_PARAMS_SUFFIX,
    COMMAND_STYLE,
    ENV_CONFIG,
    ENV_DEBUG,
    FLAG_STYLES,
    LOCAL,
    Config,
    HostConfig,
    JobConfig,
    NotifyConfig,
    builtin_jobs,
)
from thrust_remote.core.config.notify import webhook_problem
from thrust_remote.core.config.reader import SECONDS_MAX, text_problem
from thrust_remote.core.config.search import parse_params
from thrust_remote.core.config.sections import (
    RETRY_ON_DEFAULT,
    FlagsConfig,
    IdleStop,
    MetricsConfig,
    ObjectiveConfig,
    RetryConfig,
)

__all__ = [
    "BEST_PARAMS_MARK", "BEST_PARAMS_SUFFIX", "CHECKPOINT_FIELD", "COMMAND_STYLE", "CONFIG_NAME", "ENV_CONFIG",
    "ENV_DEBUG", "FLAG_STYLES", "LOCAL", "RETRY_ON_DEFAULT", "SECONDS_MAX", "Config", "FlagsConfig", "HostConfig",
    "IdleStop", "JobConfig", "MetricsConfig", "NotifyConfig", "ObjectiveConfig", "RetryConfig", "builtin_jobs",
    "find_config", "load_config", "parse_config_text", "parse_params", "project_root", "read_text", "text_problem",
    "webhook_problem",
]
