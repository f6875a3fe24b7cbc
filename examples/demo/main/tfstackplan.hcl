# Which terramate directory each environment covers. The server comes from
# TFSTACKPLAN_SERVER (the demo's server listens on a port chosen at start).
environment "dev" {
  dir = "stacks/dev"
}

environment "prod" {
  dir   = "stacks/prod"
  gated = true # without a server, prod applies are denied
}
