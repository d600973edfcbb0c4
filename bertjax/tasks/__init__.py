"""Fine-tuning: task data (GLUE, CoNLL-2003 NER, SWAG, SQuAD), features, metrics,
the fine-tuning steps and loop on top of the training machinery."""
