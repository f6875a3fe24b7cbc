tofu show -json tfstackplan.tfplan
