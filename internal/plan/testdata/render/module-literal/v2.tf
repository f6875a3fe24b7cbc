resource "terraform_data" "root" {
  input = "v1"
}
module "m" {
  source  = "./modules/m"
  api_key = "ak-live-7f3e9c2b1d"
}
