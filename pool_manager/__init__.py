"""The pool manager: sizes the spot pool from demand and replaces what AWS takes back."""
