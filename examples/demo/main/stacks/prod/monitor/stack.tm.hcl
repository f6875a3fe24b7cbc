stack {
  name        = "prod-monitor"
  description = "prod monitoring (unchanged on the demo branch, so never run there)"
  id          = "prod-monitor"
}
