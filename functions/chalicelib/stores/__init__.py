"""Stores: the contract services use (``contract.py``), and its DynamoDB and S3 implementations."""
