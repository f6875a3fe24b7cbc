# The demo project's own terramate configuration. The script library's two files
# (tfstackplan.tm.hcl, tfstackplan.scripts.tm.hcl) are copied next to this one by
# scripts/demo.sh, as its README says a user does.
terramate {
  config {
    git {
      # Changed stacks are those that differ from origin/main.
      default_remote = "origin"
      default_branch = "main"
    }
  }
}
