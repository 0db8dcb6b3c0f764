"""The IAM action behind each AWS call the store modules make, kept next to them.

The deployed roles (``tools/local_stack/modelforge_local_stack/infra.py``) grant exactly the actions of the calls each
function can reach, plus what Lambda itself does with a function's role. A test
(``tests/integration/test_aws_stack.py``) finds every call in this folder, fails on one this
table does not know, follows each function's entry point through the code to the calls it can
reach, and checks the roles both ways: nothing granted that no call needs, no call not granted.
Nothing imports this module at run time.
"""

from __future__ import annotations

#: PynamoDB calls on a model class, one of its indexes, or a model instance. ``count`` is called
#: with a hash key only (a Query with Select=COUNT; without one PynamoDB would DescribeTable).
PYNAMODB_CALLS = {
    "get": "dynamodb:GetItem",
    "batch_get": "dynamodb:BatchGetItem",
    "query": "dynamodb:Query",
    "count": "dynamodb:Query",
    "scan": "dynamodb:Scan",
    "save": "dynamodb:PutItem",
    "update": "dynamodb:UpdateItem",
    "delete": "dynamodb:DeleteItem",
}
#: The parts of a TransactWrite. TransactWriteItems has no IAM action of its own: each part needs
#: the action of the item operation it is.
TRANSACTION_CALLS = {
    "save": "dynamodb:PutItem",
    "update": "dynamodb:UpdateItem",
    "delete": "dynamodb:DeleteItem",
    "condition_check": "dynamodb:ConditionCheckItem",
}
#: S3 client calls. A presigned URL is signed with the role, so its holder may do what the URL's
#: operation needs of the role (``generate_presigned_url`` is keyed by that operation).
S3_CALLS = {
    "put_object": "s3:PutObject",
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    # CopyObject needs PutObject on the copy and GetObject on its source (which get_object has)
    "copy_object": "s3:PutObject",
}
S3_PRESIGNED = {"get_object": "s3:GetObject", "put_object": "s3:PutObject"}
#: API Gateway management API calls on the push channel's connections (stores/channel_store.py,
#: its client named ``management``): both need ManageConnections on the WebSocket API's
#: ``@connections`` resources.
CHANNEL_CALLS = {
    "post_to_connection": "execute-api:ManageConnections",
    "delete_connection": "execute-api:ManageConnections",
}
#: What Lambda does with a function's role, not the function's code: write its logs to its log
#: group, and, for the state-log function, read the outbox stream it is triggered by.
PLATFORM = {
    "APIHandler": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "WebsocketConnect": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "WebsocketMessage": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "WebsocketDisconnect": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "LivenessSweep": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "StateLog": (
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
    ),
}
