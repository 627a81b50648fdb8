"""The ``arttrace`` command and its demo (not part of the library's API)."""
