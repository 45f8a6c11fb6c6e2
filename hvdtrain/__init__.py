"""hvdtrain: synchronous (Horovod) and asynchronous (MPI parameter server) distributed training
for PyTorch, driven by one trainer loop.

    result = hvdtrain.fit(model, train_data, test_data, loss="cross_entropy", epochs=10)

See hvdtrain.api.fit for the arguments, and ``hvdtrain train --help`` for the options.
"""

__version__ = "0.1.0"

from .api import FitResult, fit  # noqa: E402
from .config import Config, ConfigError  # noqa: E402

__all__ = ["Config", "ConfigError", "FitResult", "fit", "__version__"]
