stack {
  name        = "prod-db"
  description = "prod database"
  id          = "prod-db"
  after       = ["/stacks/prod/network"]
}
