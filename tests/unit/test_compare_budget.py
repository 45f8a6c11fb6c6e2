"""A simulated plan says what its budget gives sync before it runs (compare/budget.py), and
warns when the budget is short."""

from hvdtrain.compare.budget import MIN_SYNC_STEPS, SyncBudget, sync_budget


def test_a_short_budget_is_named_with_the_epochs_that_would_do():
    short = SyncBudget(epochs=12, steps_per_epoch=5, global_batch=256, rate=0.4)
    assert short.steps == 60
    warning = short.warning(0.95)
    assert warning is not None and "60 optimizer steps" in warning
    assert "raise --epochs to 20 or more" in warning  # 20 epochs x 5 steps = MIN_SYNC_STEPS
    roomy = SyncBudget(epochs=20, steps_per_epoch=5, global_batch=256, rate=0.4)
    assert roomy.steps == MIN_SYNC_STEPS and roomy.warning(0.95) is None


def test_the_budget_counts_the_data_and_scales_the_rate():
    """Digits' training split (1437 samples) holds 5 global batches of 64 x 4 samples; the rate
    is --lr times the workers under linear scaling, --lr itself under none."""
    args = ["--dataset", "digits", "--model", "mlp", "--epochs", "12", "--batch-size", "4",
            "--lr", "0.01"]
    budget = sync_budget(args, 64)
    assert (budget.epochs, budget.steps_per_epoch, budget.global_batch) == (12, 5, 256)
    assert abs(budget.rate - 0.64) < 1e-12
    assert sync_budget([*args, "--lr-scaling", "none"], 64).rate == 0.01
    assert sync_budget([*args, "--max-steps-per-epoch", "2"], 64).steps == 24
