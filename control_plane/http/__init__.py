"""The control plane's HTTP ingress (Starlette, served by uvicorn in the control-plane process).

`app.build_app` assembles the routes of every module here (`webhooks`,
`sessions`, …) behind one error mapping; `server.HttpIngress` serves the app
on its own port beside the gRPC server and stops with it.
"""
