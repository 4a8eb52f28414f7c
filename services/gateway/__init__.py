"""The Switchyard gateway: KServe v2 REST + gRPC in front of an embedded or Triton backend.

Nothing is imported here: ``switchyard`` commands load ``services.gateway.cli`` on every start, and the application
(``services.gateway.app.create_app``, ``services.gateway.settings.Settings``) is imported only by what serves."""
