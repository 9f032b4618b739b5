"""Config overrides shared by the tests that train whole runs in seconds."""

# The `reverse` task on 64 short examples: a run that trains 2 steps and evaluates in seconds.
REVERSE = (
    "train.num_train_steps=2",
    "data.name=reverse",
    "data.num_train_examples=64",
    "data.num_eval_examples=10",
    "data.task_max_len=6",
    "data.max_source_len=8",
    "data.max_target_len=8",
)
