resource "terraform_data" "firewall" {
  input = <<-EOT
    rule 01: allow from 192.168.1.0/24 port 443
    rule 02: allow from 192.168.2.0/24 port 443
    rule 03: allow from 192.168.3.0/24 port 443
    rule 04: allow from 192.168.4.0/24 port 443
    rule 05: allow from 192.168.5.0/24 port 443
    rule 06: allow from 192.168.6.0/24 port 443
    rule 07: allow from 192.168.7.0/24 port 443
    rule 08: allow from 192.168.8.0/24 port 443
    rule 09: allow from 192.168.9.0/24 port 443
    rule 10: allow from 192.168.10.0/24 port 443
    rule 11: allow from 192.168.11.0/24 port 443
    allow 10.0.0.0/8
    rule 13: allow from 192.168.13.0/24 port 443
    rule 14: allow from 192.168.14.0/24 port 443
    rule 15: allow from 192.168.15.0/24 port 443
    rule 16: allow from 192.168.16.0/24 port 443
    rule 17: allow from 192.168.17.0/24 port 443
    rule 18: allow from 192.168.18.0/24 port 443
    rule 19: allow from 192.168.19.0/24 port 443
    rule 20: allow from 192.168.20.0/24 port 443
  EOT
}
resource "terraform_data" "hosts" {
  input = join(",", [for i in range(60) : "host${i}.example.internal"])
}
