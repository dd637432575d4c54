"""The real-SGLang suite: SGLang 0.5.23's router and tokenizer workers, with
SGLang's own locks and with pyshmlock.integrations.sglang (PYSHMLOCK_REAL_SGLANG=1)."""
