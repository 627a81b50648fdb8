"""What the tests share: servers, agents, backends and clusters they start, and helpers. No tests
here; a test module imports from ``support``, never from another test module."""
