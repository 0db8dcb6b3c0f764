"""The HTTP edge: parse requests, shape answers, the OpenAPI document and the console's files."""
