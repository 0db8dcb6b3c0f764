"""The domain: records, pure rules and errors. Imports nothing above it."""
