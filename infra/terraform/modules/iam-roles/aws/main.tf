# One IAM role per AuroraRL role and region, each with exactly the permissions of policies.tf,
# and an instance profile for the EC2 hosts (bucket credentials come from the instance profile:
# no access keys anywhere). IAM is global: instantiate this module once, with any region's provider.

resource "aws_iam_role" "trainer" {
  count = var.home_region == null ? 0 : 1

  name                 = "${var.name_prefix}-trainer"
  description          = "AuroraRL trainer: writes the home bucket's run prefix only; reads every region's results/"
  assume_role_policy   = data.aws_iam_policy_document.ec2_trust.json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "trainer" {
  count = var.home_region == null ? 0 : 1

  name   = "aurora-trainer"
  role   = aws_iam_role.trainer[0].id
  policy = data.aws_iam_policy_document.trainer[0].json
}

resource "aws_iam_instance_profile" "trainer" {
  count = var.home_region == null ? 0 : 1

  name = "${var.name_prefix}-trainer"
  role = aws_iam_role.trainer[0].name
  tags = var.tags
}

resource "aws_iam_role" "relay" {
  for_each = var.relays

  name                 = "${var.name_prefix}-relay-${each.key}"
  description          = "AuroraRL relay into ${each.key}: reads ${each.value.source}'s run prefix, writes ${each.key}'s only"
  assume_role_policy   = data.aws_iam_policy_document.ec2_trust.json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "relay" {
  for_each = var.relays

  name   = "aurora-relay"
  role   = aws_iam_role.relay[each.key].id
  policy = data.aws_iam_policy_document.relay[each.key].json
}

resource "aws_iam_instance_profile" "relay" {
  for_each = var.relays

  name = "${var.name_prefix}-relay-${each.key}"
  role = aws_iam_role.relay[each.key].name
  tags = var.tags
}

resource "aws_iam_role" "actor" {
  for_each = var.actor_regions

  name                 = "${var.name_prefix}-actor-${each.key}"
  description          = "AuroraRL actors in ${each.key}: read ${each.key}'s run prefix, put only its results/"
  assume_role_policy   = data.aws_iam_policy_document.ec2_trust.json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "actor" {
  for_each = var.actor_regions

  name   = "aurora-actor"
  role   = aws_iam_role.actor[each.key].id
  policy = data.aws_iam_policy_document.actor[each.key].json
}

resource "aws_iam_instance_profile" "actor" {
  for_each = var.actor_regions

  name = "${var.name_prefix}-actor-${each.key}"
  role = aws_iam_role.actor[each.key].name
  tags = var.tags
}

resource "aws_iam_role" "gcp_relay" {
  for_each = var.gcp_relays

  name                 = "${var.name_prefix}-gcp-relay-${each.key}"
  description          = "AuroraRL relay into ${each.key} (on Google Cloud): reads ${each.value.source}'s run prefix only"
  assume_role_policy   = data.aws_iam_policy_document.gcp_relay_trust[each.key].json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "gcp_relay" {
  for_each = var.gcp_relays

  name   = "aurora-gcp-relay"
  role   = aws_iam_role.gcp_relay[each.key].id
  policy = data.aws_iam_policy_document.gcp_relay[each.key].json
}

resource "aws_iam_role" "gcp_trainer" {
  count = var.gcp_trainer == null ? 0 : 1

  name                 = "${var.name_prefix}-gcp-trainer"
  description          = "AuroraRL trainer on Google Cloud: reads the offloaded results (results/) of the run's S3 regions only"
  assume_role_policy   = data.aws_iam_policy_document.gcp_trainer_trust[0].json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "gcp_trainer" {
  count = var.gcp_trainer == null ? 0 : 1

  name   = "aurora-gcp-trainer"
  role   = aws_iam_role.gcp_trainer[0].id
  policy = data.aws_iam_policy_document.gcp_trainer[0].json
}

resource "aws_iam_role" "gc" {
  name                 = "${var.name_prefix}-gc"
  description          = "AuroraRL retention (aurora gc): reads and deletes under the run prefix of every bucket; writes only retention records"
  assume_role_policy   = data.aws_iam_policy_document.gc_trust.json
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy" "gc" {
  for_each = var.buckets

  name   = "aurora-gc-${each.key}"
  role   = aws_iam_role.gc.id
  policy = data.aws_iam_policy_document.gc[each.key].json
}

resource "aws_iam_instance_profile" "gc" {
  name = "${var.name_prefix}-gc"
  role = aws_iam_role.gc.name
  tags = var.tags
}
