"""Model adapters behind one small interface (`base.ModelClient`)."""
