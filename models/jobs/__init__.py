"""The job room: its records (``records``), the store with one function per transition
(``store`` and ``store.sql``), and what a running job sees (``context``)."""
