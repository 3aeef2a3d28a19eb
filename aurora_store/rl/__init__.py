"""The vocabulary trainer and actors share: tasks and their rewards, models and tokenizers."""
