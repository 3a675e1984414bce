"""The data a model is run and judged on; the rest of lto comes in through this module only.

- `shapes`: `--shape` pins and MIN:OPT:MAX ranges, parsed once;
- `spec`: what a model takes (its input tensors and their batch axes) and the `InputSpec` every
  command runs with;
- `generate`: generated inputs with meaning (token ids inside the vocabulary, masks of ones), and
  the memory they will take;
- `npz`: users' `.npz` files, one reader and its checks, rows fitted to pinned shapes;
- `resolve`: one `InputSpec` from the pins, the user's file or generation;
- `rows`: which rows calibrate and which judge (the row plan), never one row for both;
- `datasets`: `--data` folders of images, text or audio, read into rows.

The modules depend on each other in that order (a module imports only those above it); the
accuracy package's minimum number of judging rows is the one thing `rows` reads from outside.
"""

from optimize.data.datasets import read_data
from optimize.data.generate import check_memory, generate_feeds, generated_samples
from optimize.data.npz import check_data_file, load_samples, read_npz
from optimize.data.resolve import feeds_from_spec, resolve_inputs
from optimize.data.rows import RealRows, RowPlan, plan_rows, read_real_rows
from optimize.data.shapes import ShapeRange, parse_shape_args, parse_shape_ranges, split_shape_args
from optimize.data.spec import (
    InputSpec,
    batch_axes,
    embedding_vocab_sizes,
    model_input_specs,
    output_batch_axes,
)

__all__ = [
    "InputSpec",
    "RealRows",
    "RowPlan",
    "ShapeRange",
    "batch_axes",
    "check_data_file",
    "check_memory",
    "embedding_vocab_sizes",
    "feeds_from_spec",
    "generate_feeds",
    "generated_samples",
    "load_samples",
    "model_input_specs",
    "output_batch_axes",
    "parse_shape_args",
    "parse_shape_ranges",
    "plan_rows",
    "read_data",
    "read_npz",
    "read_real_rows",
    "resolve_inputs",
    "split_shape_args",
]
