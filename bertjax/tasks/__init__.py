"""Fine-tuning tasks: task data, heads' inputs and outputs, and metrics."""
