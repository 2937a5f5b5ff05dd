"""Generated from proto/agenttx/v1/agenttx.proto. Do not edit."""
