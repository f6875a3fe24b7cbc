stack {
  name        = "prod-app"
  description = "prod application"
  id          = "prod-app"
  after       = ["/stacks/prod/network", "/stacks/prod/db"]
}
