# Control-plane policy of the demo (`tfstackplan serve --policy`): in prod, an apply with a
# destructive (or unclassifiable) change anywhere needs an admin's grant for that plan's
# content. dev has no gate, so its applies go ahead.
#
# The requesters are made-up service accounts: the gate leases the environment's to the apply
# (the scripts see it in TFSTACKPLAN_REQUESTER). The "none" granter records the lease and
# changes no IAM policy, so the demo needs no cloud account.
granter "none" {}

environment "prod" {
  requester = "demo-deployer@demo-project.iam.gserviceaccount.com"
  lease_ttl = "1h"
  gate {
    classes = ["destructive", "unclassified"]
    stacks  = ["**"]
  }
}

environment "dev" {
  requester = "demo-deployer-dev@demo-project.iam.gserviceaccount.com"
  lease_ttl = "1h"
}
