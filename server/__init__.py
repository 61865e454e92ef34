"""The Flight SQL protocol: messages, sessions, catalog RPCs, statements, ingest and streaming."""
