stack {
  name        = "dev-app"
  description = "dev application, configured from /config/dev.json"
  id          = "dev-app"
  after       = ["/stacks/dev/network"]
  # A change to this file outside the stack marks the stack changed.
  watch = ["/config/dev.json"]
}
