"""The relay role: copies each version of a run from one region's bucket to another's, once."""
