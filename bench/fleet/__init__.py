"""Coordination at fleet scale: ``aurora bench coord``, ``dispatch``, ``identity``, ``schedule`` and spot churn."""
