"""Training input: pre-masked records -> per-host batches in a resumable order,
dynamic masking, synthetic batches, device prefetch."""
