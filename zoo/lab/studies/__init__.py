"""Reading a sweep's runs as evidence: variants and their seeds, paired statistics, learning-rate
sensitivity, peaks, fixed settings, learning-rate tuning and the μP coordinate check."""
