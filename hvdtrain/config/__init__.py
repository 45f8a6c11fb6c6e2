"""Every option of a training run, as documented dataclasses, one module per concern.

Each field's ``metadata["help"]`` is its documentation and also its ``--flag`` help text, so the
command line (cli.py), a TOML/YAML config file and the code all read one source. Validation lives
here too: :meth:`Config.validate` rejects impossible values before any process starts talking,
with a message that names the flag and the fix.

- values.py: what the sections share (a field with its help, the readers of structured values);
- data_options.py, model_options.py (the model and the optimizer), sync_options.py,
  ps_options.py, pipeline_options.py: one section each, checking its own fields;
- run_options.py: the run section, gathered from the loop's options and those of
  eval_options.py, checkpoint_options.py, log_options.py, device_options.py and
  study_options.py (stragglers, injected faults), each checking its own;
- whole.py: ``Config``, built from flat option pairs and recorded; cross_checks.py: the
  combinations across sections. A rule's own combinations are checked in its file under
  hvdtrain/rules/ (local_sgd, balance, backup, dc_asgd, staleness_lr);
- files.py: options from a TOML or YAML file.

Callers import every name from here (``from hvdtrain.config import Config, ConfigError``);
low-level modules that only raise take ConfigError from hvdtrain/errors.py instead.
"""

from ..errors import ConfigError, too_deep
from .data_options import DataConfig
from .files import load_config_file
from .model_options import ModelConfig, OptimConfig
from .pipeline_options import PipelineConfig
from .ps_options import PSConfig
from .run_options import RunConfig
from .sync_options import SyncConfig
from .values import (MAX_SEED, STOP_AT_FORMAT, check_faults, check_writable_folder,
                     parse_bool, parse_int_tuple, parse_metric_goal, parse_stop_at)
from .whole import RECORDED_ARGS_LIMIT, SECTIONS, Config, coerce, field_owners

__all__ = ["MAX_SEED", "RECORDED_ARGS_LIMIT", "SECTIONS", "STOP_AT_FORMAT", "Config",
           "ConfigError", "DataConfig", "ModelConfig", "OptimConfig", "PSConfig",
           "PipelineConfig", "RunConfig", "SyncConfig", "check_faults", "check_writable_folder",
           "coerce", "field_owners", "load_config_file", "parse_bool", "parse_int_tuple",
           "parse_metric_goal", "parse_stop_at", "too_deep"]
